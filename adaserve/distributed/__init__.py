"""adaserve on a cluster: one node server per Ray node, and the placement controller that decides which models are
resident where (`placement`, the pure core that the controller and the fleet-scale simulator share)."""
