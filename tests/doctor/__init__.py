"""Tests of qnnctl.doctor."""
