"""Transactional messages: half and op topics, end transaction, the check-back."""
