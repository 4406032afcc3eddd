"""Tests of qnnctl.host."""
