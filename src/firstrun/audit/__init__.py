"""``firstrun audit``: what each sandbox layer stops, predicted by a model and measured for real.

Guarantee: ``model`` is pure and monotone (a layer never lets more through);
``battery`` runs every action inside every configuration a backend can
really apply and judges each cell by evidence; a cell where the two
disagree is reported, never smoothed over.
"""
