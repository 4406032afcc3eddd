"""The phone side: which files of an SDK a device needs (plan, socs), adb and pushing them (adb,
push), and `qnnctl device list|push|env|run` (commands); its doctor checks are qnnctl.doctor.device.
"""
