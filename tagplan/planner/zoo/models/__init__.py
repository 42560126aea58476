"""Builders of the zoo's training graphs, one module per architecture family.

Only the generator imports these (they need TensorFlow); readers of the zoo use
``tagplan.planner.zoo.catalog``.
"""
