# Set-up. Where the book's package is importable (a clone of its repository, or an
# install) this cell only says how the chapter runs. On a fresh notebook runtime it
# first installs the package from the book's repository, with the CUDA toolchain that
# suits the driver (nvidia-smi's "CUDA Version"), keeping the runtime's numpy.
import importlib, importlib.metadata, importlib.util, os, re, shutil, subprocess, sys, tempfile

if importlib.util.find_spec("kernels") is None:
    source = os.environ.get("FA_BOOK_SOURCE", "git+@REPOSITORY@")  # or file:///a/clone
    smi = shutil.which("nvidia-smi")
    found = smi and re.search(r"CUDA Version: (\d+)", subprocess.run(
        [smi], capture_output=True, text=True).stdout)
    cuda = int(found[1]) if found else None
    if cuda is not None and cuda < 12:
        raise RuntimeError(f"this GPU's driver runs CUDA {cuda}; the book needs 12 or newer")
    # no GPU: the CUDA 13 compilers (they need no driver); a GPU: CuPy and the toolchain
    # for its driver (torch is the runtime's own where it has one)
    extra = "cu13" if cuda is None else "gpu" if cuda >= 13 else "gpu-cu12"
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as keep:
        if importlib.util.find_spec("numpy"):  # the runtime's other packages need its numpy
            keep.write(f"numpy=={importlib.metadata.version('numpy')}\n")
    print(f"installing flashattention-from-scratch[{extra}] from {source} (a few minutes)")
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-c", keep.name,
                          f"flashattention-from-scratch[{extra}] @ {source}"])
    if pip.returncode:
        raise RuntimeError(
            "pip could not install the book's package (its message is above). If numpy "
            "is the conflict, this runtime's numpy is outside the book's range (>=2.0, "
            "<2.5: numba-cuda 0.30 cannot compile with 2.5): pip install 'numpy>=2.0,<2.5', "
            "restart the runtime and run this cell again.")
    importlib.invalidate_caches()
    if extra == "gpu-cu12" and importlib.util.find_spec("torch") is None:
        print("no torch here: install one built for CUDA 12 (README, 'On a GPU') for SDPA")

import kernels

print(kernels.describe())
