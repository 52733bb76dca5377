"""What one owner (a backend or a validation run) holds: its sandboxes, starts, batch claims, head starts and pools."""
