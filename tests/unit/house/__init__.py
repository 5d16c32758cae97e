"""Tests of the house as a whole: its layers and import graph, its docs and their citations, the
family branches, who reads the settings, and the size report."""
