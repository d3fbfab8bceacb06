"""One module per page: the tables ``python -m benchmarks.render`` writes there, and its
``BLOCKS``, each render block's name and the function of the results that makes it."""
