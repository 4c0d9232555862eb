"""adaserve on a Ray cluster: Ray runs the machines, adaserve runs the requests.

Each Ray node runs a node server, today's whole `adaserve serve` supervised by a Ray actor (`node.py`); every node
server answers for every model of the cluster, serving the models it holds and forwarding requests for the others,
their bytes unchanged, to a node that holds them (`forward.py`, by the routing table of `routes.py`). A placement
controller (`controller.py`, over the logic of `placement.py`) decides which models are resident on which nodes.
Requests never pass through Ray: it gives membership, placement of the actors, restarts and health.
"""
