"""Platform-specific byte movers. They know nothing about plans; everything above them is shared."""
