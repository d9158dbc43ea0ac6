# Runs on the MicroPython unix port: mount a LittleFS image file the way the ESP32 port mounts
# its vfs partition, and print every file with its content as JSON; with "boot" as the second
# argument, start the firmware from it instead, as a board does after boot.py.
import json
import os
import sys

import vfs

BLOCK = 4096


class FileBlockDevice:
    def __init__(self, path):
        self.file = open(path, "r+b")
        self.file.seek(0, 2)
        self.count = self.file.tell() // BLOCK

    def readblocks(self, block, buf, offset=0):
        self.file.seek(block * BLOCK + offset)
        self.file.readinto(buf)

    def writeblocks(self, block, buf, offset=0):
        self.file.seek(block * BLOCK + offset)
        self.file.write(buf)

    def ioctl(self, op, arg):
        if op == 4:  # block count
            return self.count
        if op == 5:  # block size
            return BLOCK
        if op == 6:  # erase: littlefs needs nothing done
            return 0
        return None


def walk(path, found):
    for name, kind, *_ in os.ilistdir(path):
        full = path + "/" + name
        if kind == 0x4000:
            walk(full, found)
        else:
            with open(full, "rb") as f:
                found[full[len("/flash/") :]] = f.read().decode()


fs = vfs.VfsLfs2(FileBlockDevice(sys.argv[1]), readsize=32, progsize=32, lookahead=32)
vfs.mount(fs, "/flash")
if sys.argv[2:] == ["boot"]:
    os.chdir("/flash")
    sys.path.insert(0, "/flash")
    import boot  # noqa: F401
    import main  # noqa: F401  (runs the firmware until killed)
files = {}
walk("/flash", files)
with open("/flash/written_by_micropython.txt", "w") as f:
    f.write("ok")
print(json.dumps(files))
