"""Moving trees and files in and out of a sandbox: archives, exec archives, bounded downloads, snapshots and safe extraction."""
