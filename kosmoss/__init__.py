"""kosmoss: ECMWF's radiation-column MLP from a laptop CPU to distributed data parallel.

Importing kosmoss does nothing but define names: no folders, no config, no logging
handlers. Data and runs live under ``KOSMOSS_HOME`` (default ``~/.kosmoss``).
"""
__version__ = "0.1.0"
