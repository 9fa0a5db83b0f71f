"""Re-delivery shared by the delay-level and timer services: re-writing stored records into
their real topic, and the delivery thread and staged checkpoint."""
