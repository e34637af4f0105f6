"""As²d on one device: a target-decoupled producer, an ordered candidate buffer, verification with alignment."""
