"""GNN policies (PyTorch Geometric) trained with MaskablePPO that emit plans.
Built by the policy issue; nothing lives here yet."""
