"""Tests of qnnctl.install."""
