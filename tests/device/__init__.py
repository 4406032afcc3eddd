"""Tests of qnnctl.device."""
