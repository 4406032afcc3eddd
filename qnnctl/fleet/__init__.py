"""Teams pin, share and mirror SDKs: qnnctl.lock, a mirror's folder and index.json.
Both hand what an SDK must be (install.gate.Expected) down to the install pipeline.
"""
