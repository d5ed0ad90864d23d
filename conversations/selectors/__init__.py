"""Reads for conversations, split by concern like ``conversations.services``."""
