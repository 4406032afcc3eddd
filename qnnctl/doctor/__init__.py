"""`qnnctl doctor`: every reason the SDK will not load, with its fix, grouped by what the
checks look at (the host, the SDK, the network, the lock and stores, the device).
"""
