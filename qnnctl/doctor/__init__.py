"""`qnnctl doctor`: every reason the SDK will not load, with its fix. Checks grouped by what they
look at (host, sdk, network, fleet, device) share one context; diagnose runs them, report shows them.
"""
