"""Cost models: the analytical simulator of heterogeneous training, the upper bound and the planners."""
