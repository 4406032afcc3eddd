"""Tests of qnnctl.shell."""
