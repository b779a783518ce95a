"""A whole federation on this machine over real HTTP (``glasu train --transport http``): the
processes, what is asked of the service and of each worker, and the run report."""
