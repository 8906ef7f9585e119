"""The operator side: the one read model of a cluster (snapshot), the one door for actions,
``status``, ``doctor``, dead letters and the jobs read model, shared by the CLI and the console."""
