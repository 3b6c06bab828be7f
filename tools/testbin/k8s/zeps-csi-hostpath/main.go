// Command zeps-csi-hostpath is a CSI driver for the kind e2e cluster whose volumes are folders on
// the node they were made on, and which can grow: a PVC of its StorageClass is expanded by the real
// external-resizer and kubelet, as on a cloud's disks. kind's local-path provisioner cannot expand,
// and the kubernetes-csi host-path driver is not served by the Go module proxy here, so zeps builds
// this one (the sidecars, external-provisioner and external-resizer, are the upstream ones).
//
// It runs as one DaemonSet (zeps_dev.kind.expandable_storage): on each node the node service, the
// controller service for the volumes of that node (external-provisioner --node-deployment calls it
// for the claims the scheduler put there), and kubelet's plugin registration (no
// node-driver-registrar: that module is not served either). A volume's size is bookkeeping: a
// folder has no size, so growing one records the new capacity on its node and the resizer and
// kubelet report it; nothing limits what is written.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const (
	driverName  = "hostpath.csi.zeps.dev"
	topologyKey = "topology.hostpath.csi.zeps.dev/node"
	version     = "1.0.0"
)

// names the provisioner gives volumes ("pvc-<uid>"): anything else could climb out of the root
var volumeName = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,252}$`)

type driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer
	node string
	root string     // where the volumes' folders are, on the node
	mu   sync.Mutex // one change of a volume's record at a time
}

type record struct {
	Capacity int64 `json:"capacity"`
}

func (d *driver) folder(id string) (string, error) {
	if !volumeName.MatchString(id) {
		return "", status.Errorf(codes.InvalidArgument, "volume id %q is not a name this driver made", id)
	}
	return filepath.Join(d.root, id), nil
}

func (d *driver) readRecord(id string) (record, error) {
	var r record
	folder, err := d.folder(id)
	if err != nil {
		return r, err
	}
	data, err := os.ReadFile(folder + ".json")
	if errors.Is(err, os.ErrNotExist) {
		return r, status.Errorf(codes.NotFound, "no volume %s on node %s", id, d.node)
	}
	if err != nil {
		return r, status.Error(codes.Internal, err.Error())
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, status.Errorf(codes.Internal, "volume %s: its record: %v", id, err)
	}
	return r, nil
}

func (d *driver) writeRecord(id string, r record) error {
	folder, err := d.folder(id)
	if err != nil {
		return err
	}
	data, _ := json.Marshal(r)
	tmp := folder + ".json.tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if err := os.Rename(tmp, folder+".json"); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return nil
}

// -- identity -------------------------------------------------------------------------------------

func (d *driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: driverName, VendorVersion: version}, nil
}

func (d *driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (
	*csi.GetPluginCapabilitiesResponse, error) {
	service := func(t csi.PluginCapability_Service_Type) *csi.PluginCapability {
		return &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: t}}}
	}
	online := &csi.PluginCapability{Type: &csi.PluginCapability_VolumeExpansion_{
		VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE}}}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{
		service(csi.PluginCapability_Service_CONTROLLER_SERVICE),
		service(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS),
		online,
	}}, nil
}

func (d *driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

// -- controller (on the volume's own node: external-provisioner --node-deployment) -------------------

func (d *driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (
	*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (d *driver) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	for _, c := range req.GetVolumeCapabilities() {
		if c.GetBlock() != nil {
			return nil, status.Error(codes.InvalidArgument, "block volumes are not supported: folders only")
		}
	}
	folder, err := d.folder(req.GetName())
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	capacity := req.GetCapacityRange().GetRequiredBytes()
	if r, err := d.readRecord(req.GetName()); err == nil { // asked again: the same answer
		capacity = r.Capacity
	} else if err := os.MkdirAll(folder, 0o777); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	} else if err := os.Chmod(folder, 0o777); err != nil { // any pod's user may write (fsGroup chowns it too)
		return nil, status.Error(codes.Internal, err.Error())
	} else if err := d.writeRecord(req.GetName(), record{Capacity: capacity}); err != nil {
		return nil, err
	}
	log.Printf("volume %s: %d bytes on node %s", req.GetName(), capacity, d.node)
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{
		VolumeId: req.GetName(), CapacityBytes: capacity,
		AccessibleTopology: []*csi.Topology{{Segments: map[string]string{topologyKey: d.node}}},
	}}, nil
}

func (d *driver) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	folder, err := d.folder(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := os.RemoveAll(folder); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := os.Remove(folder + ".json"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	log.Printf("volume %s: deleted", req.GetVolumeId())
	return &csi.DeleteVolumeResponse{}, nil
}

func (d *driver) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (
	*csi.ValidateVolumeCapabilitiesResponse, error) {
	if _, err := d.readRecord(req.GetVolumeId()); err != nil {
		return nil, err
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeCapabilities: req.GetVolumeCapabilities()}}, nil
}

// ControllerExpandVolume accepts the new size and asks kubelet to finish on the node
// (NodeExpandVolume), as a disk's filesystem would need. The resizer is leader-elected, so this may
// run on another node than the volume's: the size is recorded there, by NodeExpandVolume.
func (d *driver) ControllerExpandVolume(_ context.Context, req *csi.ControllerExpandVolumeRequest) (
	*csi.ControllerExpandVolumeResponse, error) {
	if _, err := d.folder(req.GetVolumeId()); err != nil {
		return nil, err
	}
	asked := req.GetCapacityRange().GetRequiredBytes()
	if asked <= 0 {
		return nil, status.Error(codes.InvalidArgument, "no size asked for")
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: asked, NodeExpansionRequired: true}, nil
}

// -- node -----------------------------------------------------------------------------------------

func (d *driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: d.node,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{topologyKey: d.node}}}, nil
}

func (d *driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (
	*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{Capabilities: []*csi.NodeServiceCapability{{
		Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{
			Type: csi.NodeServiceCapability_RPC_EXPAND_VOLUME}}}}}, nil
}

// NodePublishVolume bind-mounts the volume's folder at the pod's target path.
func (d *driver) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (
	*csi.NodePublishVolumeResponse, error) {
	folder, err := d.folder(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	target := req.GetTargetPath()
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "no target path")
	}
	if _, err := os.Stat(folder); err != nil {
		return nil, status.Errorf(codes.NotFound, "volume %s is not on node %s: %v", req.GetVolumeId(), d.node, err)
	}
	if mounted(target) {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := syscall.Mount(folder, target, "", syscall.MS_BIND, ""); err != nil {
		return nil, status.Errorf(codes.Internal, "bind %s at %s: %v", folder, target, err)
	}
	if req.GetReadonly() {
		flags := uintptr(syscall.MS_BIND | syscall.MS_REMOUNT | syscall.MS_RDONLY)
		if err := syscall.Mount("", target, "", flags, ""); err != nil {
			_ = syscall.Unmount(target, 0)
			return nil, status.Errorf(codes.Internal, "read-only %s: %v", target, err)
		}
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (d *driver) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (
	*csi.NodeUnpublishVolumeResponse, error) {
	target := req.GetTargetPath()
	if mounted(target) {
		if err := syscall.Unmount(target, 0); err != nil {
			return nil, status.Errorf(codes.Internal, "unmount %s: %v", target, err)
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeExpandVolume records the new size on the volume's node (never a smaller one): a folder has
// nothing else to grow.
func (d *driver) NodeExpandVolume(_ context.Context, req *csi.NodeExpandVolumeRequest) (
	*csi.NodeExpandVolumeResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, err := d.readRecord(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if asked := req.GetCapacityRange().GetRequiredBytes(); asked > r.Capacity {
		r.Capacity = asked
		if err := d.writeRecord(req.GetVolumeId(), r); err != nil {
			return nil, err
		}
	}
	log.Printf("volume %s: %d bytes at %s", req.GetVolumeId(), r.Capacity, req.GetVolumePath())
	return &csi.NodeExpandVolumeResponse{CapacityBytes: r.Capacity}, nil
}

// mounted: whether path is a mount point (listed in /proc/self/mountinfo: a bind of the same
// filesystem has the same device, so a stat would not tell)
func mounted(path string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	clean := filepath.Clean(path)
	for _, line := range strings.Split(string(data), "\n") {
		if fields := strings.Fields(line); len(fields) > 4 && fields[4] == clean {
			return true
		}
	}
	return false
}

// -- kubelet's plugin registration --------------------------------------------------------------------

type registrar struct {
	endpoint string // the CSI socket's path as kubelet sees it
}

func (r registrar) GetInfo(context.Context, *registration.InfoRequest) (*registration.PluginInfo, error) {
	return &registration.PluginInfo{Type: registration.CSIPlugin, Name: driverName, Endpoint: r.endpoint,
		SupportedVersions: []string{"1.0.0"}}, nil
}

func (r registrar) NotifyRegistrationStatus(_ context.Context, s *registration.RegistrationStatus) (
	*registration.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		log.Printf("kubelet refused the registration: %s", s.Error)
	} else {
		log.Printf("registered with kubelet")
	}
	return &registration.RegistrationStatusResponse{}, nil
}

func listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return net.Listen("unix", path)
}

func main() {
	socket := flag.String("socket", "/csi/csi.sock", "the CSI socket, in this container")
	kubeletSocket := flag.String("kubelet-socket", "/var/lib/kubelet/plugins/"+driverName+"/csi.sock",
		"the same socket's path on the node (kubelet dials it)")
	registrationDir := flag.String("registration-dir", "/registration",
		"kubelet's plugins_registry folder, in this container")
	root := flag.String("root", "/var/lib/zeps-csi", "where the volumes' folders are")
	flag.Parse()
	node := os.Getenv("NODE_NAME")
	if node == "" {
		log.Fatal("NODE_NAME is not set: give it the node's name (fieldRef spec.nodeName)")
	}
	if err := os.MkdirAll(*root, 0o755); err != nil {
		log.Fatal(err)
	}
	d := &driver{node: node, root: *root}
	server := grpc.NewServer()
	csi.RegisterIdentityServer(server, d)
	csi.RegisterControllerServer(server, d)
	csi.RegisterNodeServer(server, d)
	lis, err := listen(*socket)
	if err != nil {
		log.Fatalf("listen on %s: %v", *socket, err)
	}
	reg := grpc.NewServer()
	registration.RegisterRegistrationServer(reg, registrar{endpoint: *kubeletSocket})
	regLis, err := listen(filepath.Join(*registrationDir, driverName+"-reg.sock"))
	if err != nil {
		log.Fatalf("listen for kubelet's registration: %v", err)
	}
	go func() { log.Fatal(server.Serve(lis)) }()
	go func() { log.Fatal(reg.Serve(regLis)) }()
	log.Printf("%s %s serving node %s at %s (volumes in %s)", driverName, version, node, *socket, *root)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	reg.Stop()
	server.GracefulStop()
	_ = os.Remove(filepath.Join(*registrationDir, driverName+"-reg.sock"))
}
