//! Parsers for what the driver and kernel publish; they take bytes, never paths.
