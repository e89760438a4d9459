"""Stateless torch functions shared by metrics and callbacks."""
