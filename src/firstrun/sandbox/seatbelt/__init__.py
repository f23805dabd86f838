"""The macOS Seatbelt backend's launch spec: profile text plus ``-D`` parameters."""
