"""Tests of qnnctl.fleet."""
