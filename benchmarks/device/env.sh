# Source on the device, in the repo root: the carried wheels unpacked onto PYTHONPATH, and the GGUF parts
# carried so far gathered in /tmp (which lasts while the machine stays warm), joined into /tmp/smol.gguf
# once all three have come.
python3 - <<'PY'
import glob, zipfile
for w in glob.glob(".carry/wheels/*.whl"):
    zipfile.ZipFile(w).extractall("/tmp/pp")
PY
export PYTHONPATH=$PWD:/tmp/pp
for i in 1 2 3; do [ -f .carry/g$i/p ] && cp .carry/g$i/p /tmp/smol.p$i; done
if [ -f /tmp/smol.p1 ] && [ -f /tmp/smol.p2 ] && [ -f /tmp/smol.p3 ] && [ ! -f /tmp/smol.gguf ]; then
    cat /tmp/smol.p1 /tmp/smol.p2 /tmp/smol.p3 > /tmp/smol.gguf && md5sum /tmp/smol.gguf
fi
ls /tmp/smol.* 2>/dev/null | tr '\n' ' '; echo
