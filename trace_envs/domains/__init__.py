"""τ²-style customer-service domains (airline, retail) and their shared machinery."""
