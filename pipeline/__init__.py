"""CCNet-style multilingual corpus pipeline on Apache Beam."""
