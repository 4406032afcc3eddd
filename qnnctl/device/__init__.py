"""The phone side: one coherent set of QNN libraries on an Android device, and running there.

- `socs`: which HTP generation each Qualcomm SoC has, and the QAIRT release that first serves
  it (data, with its source and date);
- `plan`: which files of an SDK a device needs, and the device shell's environment;
- `adb`: finding adb, the devices it sees, and the few commands qnnctl sends through it;
- `push`: putting a plan on a device (skipping what is there, verifying what was sent);
  (`qnnctl doctor --device`'s checks are doctor's: qnnctl.doctor.device).

Importing any of them does nothing: no adb is run until a function is called.
"""
