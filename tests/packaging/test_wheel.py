"""A non-editable wheel install imports fedsim, fedsim.strategies and fedsim.scenarios (with its TOML files),
and carries the fused kernel's C source, which builds there."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_wheel_installs_namespaced_packages(tmp_path):
    # Flower's Ray backend puts the app directory (this repository) on os.environ["PYTHONPATH"] when a
    # simulation runs in this process: with it, pip would take the source tree's fedsim.egg-info for an
    # installed fedsim and skip the wheel. Nothing here may see the source tree.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    # build from a clean copy: no shared build/ folder with another process, no stale files
    src = tmp_path / "src"
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "build", "dist", "runs", "*.egg-info", "__pycache__", ".pytest_cache"
        ),
    )
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(src),
        ],
        check=True,
        cwd=tmp_path,
        env=env,
    )
    wheels = list(dist.glob("fedsim-*.whl"))
    assert len(wheels) == 1
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    py = venv / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheels[0])],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        ).stdout.strip()
    )
    # fedsim comes from the wheel; its dependencies from this environment (a plain path entry, so this
    # environment's editable-install hook is *not* active there)
    (site / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    code = (
        "import fedsim, fedsim.strategies, fedsim.scenarios, fedsim.privacy, fedsim.engine.runner;"
        "from fedsim.scenarios import available_scenarios, load_scenario;"
        "assert 'quickstart' in available_scenarios(), available_scenarios();"
        "load_scenario('quickstart');"
        "print(fedsim.strategies.__file__); print(fedsim.scenarios.__file__);"
        # the shipped models are reached by reference from the installed package, as a user's factory is
        "from fedsim.factories import build_model; import torch;"
        "m = build_model('fedsim.models.registry:cnn2d', (1, 8, 8), 10);"
        "assert m(torch.zeros(2, 1, 8, 8)).shape == (2, 10)"
    )
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    for line in out.split():
        assert line.startswith(str(site)), (line, site)
    assert "strategies" in out and "scenarios" in out
