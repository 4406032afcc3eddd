"""Tests of qnnctl.sdk."""
