"""osmosis-harbor: Osmosis rollouts as Harbor trials in SkyPilot (or local Docker) sandboxes."""
