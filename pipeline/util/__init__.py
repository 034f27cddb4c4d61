"""Generic helpers with no pipeline knowledge: user errors, strict YAML configs, fault points for tests."""
