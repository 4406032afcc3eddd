"""Tests of qnnctl.net."""
