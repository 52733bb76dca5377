"""Task images: builds and pushes, the base images a build needs, and which live processes hold an image."""
