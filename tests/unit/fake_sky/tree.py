"""A sandbox's filesystem, in memory: directories, files with modes, symbolic links.

Paths are absolute POSIX paths inside the sandbox; nothing here ever touches the host's disk.
Links are followed inside the tree (at most 40 hops, as Linux), never outside it. Tar archives
are read and written member by member with ``tarfile`` over bytes, so an archive's names are
judged here (absolute names and ``..`` are refused) and never reach a host path.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from dataclasses import dataclass, field

__all__ = ["BASE_DIRS", "Dir", "File", "Link", "Tree", "TreeError"]

# What every fake image has (the directories the product and Harbor expect to find).
BASE_DIRS = ("/", "/tmp", "/root", "/etc", "/home", "/usr", "/usr/bin", "/bin", "/var", "/var/tmp")
MAX_HOPS = 40


class TreeError(Exception):
    """A filesystem error with its errno-style reason (``ENOENT``, ``EISDIR``, ...)."""

    def __init__(self, reason: str, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.reason, self.path, self.message = reason, path, message


@dataclass
class Dir:
    mode: int = 0o755


@dataclass
class File:
    data: bytes = b""
    mode: int = 0o644


@dataclass
class Link:
    target: str
    mode: int = 0o777


Node = Dir | File | Link


def _missing(path: str) -> TreeError:
    return TreeError("ENOENT", path, "No such file or directory")


@dataclass
class Tree:
    """One sandbox's files, keyed by normalised absolute path."""

    nodes: dict[str, Node] = field(default_factory=lambda: {path: Dir() for path in BASE_DIRS})

    @staticmethod
    def absolute(path: str, cwd: str = "/") -> str:
        return posixpath.normpath(posixpath.join(cwd, path)).replace("//", "/")

    def resolve(self, path: str, *, follow_last: bool = True) -> str:
        """``path`` with every link in it followed (the last one too unless ``follow_last``)."""
        parts = [p for p in self.absolute(path).split("/") if p]
        done, hops = "/", 0
        while parts:
            current = posixpath.join(done, parts.pop(0))
            node = self.nodes.get(current)
            if isinstance(node, Link) and (parts or follow_last):
                hops += 1
                if hops > MAX_HOPS:
                    raise TreeError("ELOOP", path, "Too many levels of symbolic links")
                target = posixpath.join(posixpath.dirname(current), node.target)
                parts = [p for p in self.absolute(target).split("/") if p] + parts
                done = "/"
                continue
            if parts and node is not None and not isinstance(node, Dir):
                raise TreeError("ENOTDIR", path, "Not a directory")
            done = current
        return done

    def get(self, path: str, *, follow: bool = True) -> Node | None:
        try:
            return self.nodes.get(self.resolve(path, follow_last=follow))
        except TreeError:
            return None

    def read(self, path: str) -> bytes:
        node = self.get(path)
        if node is None:
            raise _missing(path)
        if isinstance(node, Dir):
            raise TreeError("EISDIR", path, "Is a directory")
        assert isinstance(node, File)
        return node.data

    def _parent_dir(self, path: str) -> str:
        parent = self.resolve(posixpath.dirname(self.absolute(path)))
        if not isinstance(self.nodes.get(parent), Dir):
            raise _missing(path)
        return parent

    def write(self, path: str, data: bytes, *, mode: int | None = None, append: bool = False) -> None:
        """Write a file into an existing directory (a write makes no parent, as SkyPilot's)."""
        real = posixpath.join(self._parent_dir(path), posixpath.basename(self.absolute(path)))
        real = self.resolve(real)
        node = self.nodes.get(real)
        if isinstance(node, Dir):
            raise TreeError("EISDIR", path, "Is a directory")
        old = node.data if isinstance(node, File) else b""
        keep = node.mode if isinstance(node, File) else 0o644
        self.nodes[real] = File(old + data if append else data, keep if mode is None else mode)

    def mkdir(self, path: str, *, parents: bool = False, mode: int = 0o755) -> None:
        target = self.absolute(path)
        node = self.get(target)
        if node is not None:
            if parents and isinstance(node, Dir):
                return
            raise TreeError("EEXIST", path, "File exists")
        parent = posixpath.dirname(target)
        if self.get(parent) is None:
            if not parents:
                raise _missing(path)
            self.mkdir(parent, parents=True)
        self.nodes[posixpath.join(self._parent_dir(target), posixpath.basename(target))] = Dir(mode)

    def symlink(self, target: str, path: str) -> None:
        if self.get(path, follow=False) is not None:
            raise TreeError("EEXIST", path, "File exists")
        self.nodes[posixpath.join(self._parent_dir(path), posixpath.basename(self.absolute(path)))] = Link(target)

    def children(self, path: str) -> list[str]:
        """The direct children of directory ``path`` (resolved), sorted."""
        real = self.resolve(path)
        prefix = real.rstrip("/") + "/"
        return sorted(p for p in self.nodes if p.startswith(prefix) and "/" not in p[len(prefix) :] and p != real)

    def remove(self, path: str, *, recursive: bool = False) -> None:
        real = posixpath.join(self.resolve(posixpath.dirname(self.absolute(path))), posixpath.basename(path))
        node = self.nodes.get(real)
        if node is None:
            raise _missing(path)
        if isinstance(node, Dir):
            if not recursive:
                raise TreeError("EISDIR", path, "Is a directory")
            if real == "/":
                raise TreeError("EPERM", path, "refusing to remove '/'")
            for child in [p for p in self.nodes if p.startswith(real.rstrip("/") + "/")]:
                del self.nodes[child]
        del self.nodes[real]

    def chmod(self, path: str, mode: int) -> None:
        node = self.get(path)
        if node is None:
            raise _missing(path)
        node.mode = mode

    # ── archives ────────────────────────────────────────────────────────────────

    def pack(self, roots: list[tuple[str, str]], *, gzip: bool = False) -> bytes:
        """A tar of each ``(path, arcname)``: members named from ``arcname``, links kept as links."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz" if gzip else "w") as tar:
            for path, arcname in roots:
                self._add(tar, path, arcname)
        return buffer.getvalue()

    def _add(self, tar: tarfile.TarFile, path: str, arcname: str) -> None:
        root = self.resolve(path)
        if self.nodes.get(root) is None:
            raise _missing(path)
        for real in [root, *sorted(p for p in self.nodes if p.startswith(root.rstrip("/") + "/"))]:
            name = posixpath.normpath(posixpath.join(arcname, posixpath.relpath(real, root)))
            node, info = self.nodes[real], tarfile.TarInfo(name)
            info.mode = node.mode
            if isinstance(node, Dir):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(node, Link):
                info.type, info.linkname = tarfile.SYMTYPE, node.target
                tar.addfile(info)
            else:
                info.size = len(node.data)
                tar.addfile(info, io.BytesIO(node.data))

    def unpack(self, data: bytes, directory: str) -> int:
        """Extract a tar (plain or gzipped) into existing ``directory``; returns members written.
        Refuses what a safe extraction refuses: absolute names, ``..``, devices, hard links."""
        base = self.resolve(directory)
        if not isinstance(self.nodes.get(base), Dir):
            raise _missing(directory)
        try:
            tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
        except tarfile.TarError as exc:
            raise TreeError("EINVAL", directory, f"not a tar archive: {exc}") from None
        written = 0
        with tar:
            for member in tar.getmembers():
                name = posixpath.normpath(member.name)
                if name == ".":
                    continue
                if name.startswith(("/", "../")) or name == "..":
                    raise TreeError("EPERM", member.name, "member leaves the target directory")
                target = posixpath.join(base, name)
                if member.isdir():
                    self.mkdir(target, parents=True, mode=member.mode)
                    self.chmod(target, member.mode)
                elif member.issym():
                    self.mkdir(posixpath.dirname(target), parents=True)
                    if self.get(target, follow=False) is not None:
                        self.remove(target, recursive=True)
                    self.symlink(member.linkname, target)
                elif member.isfile():
                    self.mkdir(posixpath.dirname(target), parents=True)
                    reader = tar.extractfile(member)
                    self.write(target, reader.read() if reader else b"", mode=member.mode)
                    self.chmod(target, member.mode)
                else:
                    raise TreeError("EPERM", member.name, f"member type {member.type!r} is not extracted")
                written += 1
        return written
