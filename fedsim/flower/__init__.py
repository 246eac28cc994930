"""fedsim's round loop on a Flower Grid: the message protocol between the ServerApp and the ClientApp
(:mod:`.protocol`), a Grid that addresses nodes by client id (:mod:`.grid`) and the engine whose clients are
Flower nodes (:mod:`.grid_engine`). The ServerApp and ClientApp themselves are in :mod:`fedsim.apps`."""
