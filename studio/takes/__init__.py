"""The one way in for every take: the order, its plan, its run, the GPU line and the history."""
