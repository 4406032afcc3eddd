"""Tests of qnnctl.run."""
