"""The learned cost model: graph encoding, surrogate, corrected model, data sets and training.

torch is imported by the modules that need it; torch-geometric only inside
:func:`hetpart.costmodel.learned.graph.to_pyg`.
"""
