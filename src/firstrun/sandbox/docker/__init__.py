"""The docker backend's parts: the topology as data, labelled resources and their reaping."""
