"""Event and command models, the topic catalog and the codec shared by every Governor component."""
