"""The runtime: executes plans with torch.distributed and measures real throughput."""
