"""What a person reads: terminal tables (rich) now; figures and HTML reports later."""
