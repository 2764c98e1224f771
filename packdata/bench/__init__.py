"""Measuring input pipelines: sample rates of loaders, and the baselines to compare them with."""
