"""Development tooling kept beside the playground, not shipped with it (the Space image copies only playground/)."""
