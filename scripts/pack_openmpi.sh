#!/usr/bin/env bash
# Copies a relocatable Open MPI 4.1 runtime (Debian's openmpi-bin / libopenmpi3 / libpmix2) into
# DEST, so that `mpirun -np N` works on one machine (shared memory) where none of Open MPI, PMIx,
# hwloc or libevent is installed, wherever DEST is unpacked (e.g. the GPU machine, as root):
#   bash scripts/pack_openmpi.sh DEST
#   ...copy DEST anywhere...; source DEST/env.sh; mpirun --allow-run-as-root -np 2 ./prog
# Layout: bin/{mpirun,mpiexec,orted}; lib/ (libmpi and every library that ldd lists for mpirun,
# orted and the plugins, except glibc's); lib/openmpi-plugins/ and lib/pmix-plugins/ (MCA
# components); share/{openmpi,pmix}/ (help texts); etc/ (Debian's openmpi-mca-params.conf and
# default hostfile); env.sh. Debian compiles absolute paths into libopen-pal and libpmix (e.g.
# sysconfdir /etc/openmpi, PMIx's libdir /usr/lib/x86_64-linux-gnu/pmix2/lib), so env.sh sets
# each directory the runtime looks in through the "env" installdirs components of Open MPI
# (OPAL_*) and PMIx 4.2 (PMIX_*), relative to where env.sh lies.
# Plugins that need a fabric library (UCX, libfabric, verbs, PSM) or OpenSHMEM are left out:
# single-node shared memory (btl vader/self) needs none, and Debian's own params disable most.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DEST" >&2; exit 2; }
dest=$1
orterun=$(command -v orterun) orted=$(command -v orted)
# Source directories, as the installed Open MPI reports them and next to the libpmix it uses.
ompi_path() { ompi_info --path "$1" --parsable | sed -n "s/^path:$1://p"; }
ompi_plugins=$(ompi_path pkglibdir) ompi_data=$(ompi_path pkgdatadir) ompi_etc=$(ompi_path sysconfdir)
pmix_so=$(ldd "$ompi_plugins/mca_pmix_ext3x.so" | awk '$1 ~ /^libpmix\.so/ {print $3}')
pmix_lib=$(dirname "$(readlink -f "$pmix_so")")
pmix_plugins=$pmix_lib/pmix pmix_data=$pmix_lib/../share/pmix

mkdir -p "$dest"/{bin,lib/openmpi-plugins,lib/pmix-plugins,lib/hwloc-plugins,share,etc}
dest=$(cd "$dest" && pwd)
cp "$orterun" "$dest/bin/mpirun"
cp "$orted" "$dest/bin/orted"
ln -sf mpirun "$dest/bin/mpiexec"
for so in "$ompi_plugins"/*.so; do
  [[ $(ldd "$so") =~ lib(ucp|uct|ucs|fabric|ibverbs|rdmacm|psm|oshmem) ]] || cp "$so" "$dest/lib/openmpi-plugins/"
done
cp "$pmix_plugins"/*.so "$dest/lib/pmix-plugins/"
# Every library these load (libmpi comes in with the pml/coll plugins), without glibc itself.
for f in "$dest"/bin/{mpirun,orted} "$dest"/lib/*-plugins/*.so; do ldd "$f"; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  grep -vE '^(libc|libm|libmvec|libpthread|libdl|librt|libutil|libresolv|libanl|libnsl|ld-linux[^ ]*)\.so' |
  while read -r name path; do cp -L "$path" "$dest/lib/$name"; done
cp -rT "$ompi_data" "$dest/share/openmpi"
cp -rT "$pmix_data" "$dest/share/pmix"
cp "$ompi_etc"/openmpi-mca-params.conf "$ompi_etc"/openmpi-default-hostfile "$dest/etc/"

cat >"$dest/env.sh" <<'EOF'
# Source this (bash) to use the Open MPI runtime in this directory, wherever it was unpacked.
_ompi=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH="$_ompi/bin${PATH:+:$PATH}"
export LD_LIBRARY_PATH="$_ompi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Open MPI's installdirs "env" component; Debian's sysconfdir and libdir are absolute, so
# OPAL_PREFIX alone would not move them. pkglibdir is the component path, pkgdatadir the help
# texts, sysconfdir the MCA params file and default hostfile, bindir where orted is found.
export OPAL_PREFIX="$_ompi" OPAL_EXEC_PREFIX="$_ompi" OPAL_BINDIR="$_ompi/bin" \
  OPAL_LIBDIR="$_ompi/lib" OPAL_PKGLIBDIR="$_ompi/lib/openmpi-plugins" \
  OPAL_DATAROOTDIR="$_ompi/share" OPAL_DATADIR="$_ompi/share" \
  OPAL_PKGDATADIR="$_ompi/share/openmpi" OPAL_SYSCONFDIR="$_ompi/etc"
# PMIx 4.2's pinstalldirs "env" component (PMIX_PREFIX, not PMIX_INSTALL_PREFIX, in 4.2): the
# component path starts at pkglibdir (a PMIX_MCA_mca_base_component_path would only be appended
# to it), help texts in pkgdatadir, pmix-mca-params.conf (none shipped) in sysconfdir.
export PMIX_PREFIX="$_ompi" PMIX_EXEC_PREFIX="$_ompi" PMIX_BINDIR="$_ompi/bin" \
  PMIX_LIBDIR="$_ompi/lib" PMIX_PKGLIBDIR="$_ompi/lib/pmix-plugins" \
  PMIX_DATAROOTDIR="$_ompi/share" PMIX_DATADIR="$_ompi/share" \
  PMIX_PKGDATADIR="$_ompi/share/pmix" PMIX_SYSCONFDIR="$_ompi/etc"
# hwloc's I/O plugins (PCI, OpenCL, GL, libxml) are not needed for shared memory; an empty
# plugin directory keeps hwloc from loading the build machine's (and their X11/ICU/libxml deps).
export HWLOC_PLUGINS_PATH="$_ompi/lib/hwloc-plugins"
# Launch on this node only. Otherwise plm/rsh, with its default agent "ssh : rsh", aborts mpirun
# ("plm_rsh_agent ... could not be found") on a machine without ssh, even for local ranks.
export OMPI_MCA_plm="${OMPI_MCA_plm:-isolated}"
# Shared memory copies through a buffer instead of reading the other process's memory (CMA): a
# container without CAP_SYS_PTRACE refuses those reads, which ends the job on a large message.
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
unset _ompi
EOF
echo "Open MPI runtime in $dest ($(du -sh "$dest" | cut -f1)); use: source $dest/env.sh"
