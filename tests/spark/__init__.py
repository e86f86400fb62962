"""Tests of the PySpark connector (engine/spark); see conftest.py."""
