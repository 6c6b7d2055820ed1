//! Bytes that are no valid request: invalid UTF-8 in a string field, an overlong UTF-8
//! encoding, a truncated varint, a length beyond the message, an unknown wire type, field
//! number 0 and random bytes, sent to every method of the three services through a raw
//! codec, as no typed client can.
//!
//! The answer must be the one prost decoding predicts: INTERNAL for bytes that do not
//! decode (the code the gRPC status code table gives a server that cannot parse a
//! request, and what tonic answers), otherwise exactly what the decoded request gets from
//! a typed client. Afterwards the driver still serves and made nothing.
//!
//! RPCs: all of Identity, Controller and Node.

use ferrovol::csi::v1::*;
use prost::bytes::{Buf, BufMut};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

use crate::harness::Driver;
use crate::hostile::Table;
use crate::requests::ok;

/// A codec that sends and receives raw bytes, for requests no typed client can build.
#[derive(Debug, Clone, Default)]
struct RawCodec;

#[derive(Debug, Clone, Default)]
struct RawEncoder;

#[derive(Debug, Clone, Default)]
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let mut out = vec![0; buf.remaining()];
        buf.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

/// Sends `bytes` as the request of the method at `path`.
async fn raw_call(
    channel: Channel,
    path: &str,
    bytes: Vec<u8>,
) -> Result<Response<Vec<u8>>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("not ready: {e}")))?;
    let path: PathAndQuery = path.parse().expect("a method path");
    grpc.unary(tonic::Request::new(bytes), path, RawCodec).await
}

/// Payloads that are not valid requests of most types.
fn malformed_payloads() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        // Field 1, length 4, not UTF-8.
        (
            "invalid UTF-8 in field 1",
            vec![0x0a, 0x04, 0xff, 0xfe, 0xc0, 0x80],
        ),
        // Field 2 (a string in most requests), overlong UTF-8 encoding of '/'.
        ("overlong UTF-8 in field 2", vec![0x12, 0x02, 0xc0, 0xaf]),
        ("a truncated varint", vec![0x08, 0xff]),
        (
            "a length beyond the message",
            vec![0x0a, 0xff, 0xff, 0xff, 0x0f, 0x41],
        ),
        ("wire type 7", vec![0x0f]),
        ("field number 0", vec![0x02, 0x00]),
        (
            "random bytes",
            (0u16..512)
                .map(|i| (i.wrapping_mul(151) >> 1) as u8)
                .collect(),
        ),
    ]
}

/// One method of the raw pass: its path, and a function that predicts its answer to a
/// payload (decode locally; undecodable is INTERNAL, decodable is what the typed call
/// answers).
macro_rules! raw_methods {
    ($( $path:literal => $req:ty, $client:ident, $call:ident; )*) => {
        async fn raw_pass(d: &Driver, table: &mut Table) {
            for (what, payload) in malformed_payloads() {
                $(
                    let answer = raw_call(d.connect().await.expect("connect"), $path, payload.clone()).await;
                    match <$req>::decode(payload.as_slice()) {
                        Err(_) => {
                            table.expect(&format!("{} with {what}", $path), answer.map(|r| Response::new(r.into_inner().len())), Code::Internal);
                        }
                        Ok(decoded) => {
                            let typed = d.$client().$call(decoded).await;
                            let want = match &typed { Ok(_) => Code::Ok, Err(s) => s.code() };
                            table.expect(&format!("{} with {what} (decodes)", $path), answer.map(|r| Response::new(r.into_inner().len())), want);
                        }
                    }
                )*
            }
        }
    };
}

raw_methods! {
    "/csi.v1.Identity/GetPluginInfo" => GetPluginInfoRequest, identity, get_plugin_info;
    "/csi.v1.Identity/GetPluginCapabilities" => GetPluginCapabilitiesRequest, identity, get_plugin_capabilities;
    "/csi.v1.Identity/Probe" => ProbeRequest, identity, probe;
    "/csi.v1.Controller/CreateVolume" => CreateVolumeRequest, controller, create_volume;
    "/csi.v1.Controller/DeleteVolume" => DeleteVolumeRequest, controller, delete_volume;
    "/csi.v1.Controller/ControllerPublishVolume" => ControllerPublishVolumeRequest, controller, controller_publish_volume;
    "/csi.v1.Controller/ControllerUnpublishVolume" => ControllerUnpublishVolumeRequest, controller, controller_unpublish_volume;
    "/csi.v1.Controller/ValidateVolumeCapabilities" => ValidateVolumeCapabilitiesRequest, controller, validate_volume_capabilities;
    "/csi.v1.Controller/ListVolumes" => ListVolumesRequest, controller, list_volumes;
    "/csi.v1.Controller/GetCapacity" => GetCapacityRequest, controller, get_capacity;
    "/csi.v1.Controller/ControllerGetCapabilities" => ControllerGetCapabilitiesRequest, controller, controller_get_capabilities;
    "/csi.v1.Controller/CreateSnapshot" => CreateSnapshotRequest, controller, create_snapshot;
    "/csi.v1.Controller/DeleteSnapshot" => DeleteSnapshotRequest, controller, delete_snapshot;
    "/csi.v1.Controller/ListSnapshots" => ListSnapshotsRequest, controller, list_snapshots;
    "/csi.v1.Controller/GetSnapshot" => GetSnapshotRequest, controller, get_snapshot;
    "/csi.v1.Controller/ControllerExpandVolume" => ControllerExpandVolumeRequest, controller, controller_expand_volume;
    "/csi.v1.Controller/ControllerGetVolume" => ControllerGetVolumeRequest, controller, controller_get_volume;
    "/csi.v1.Controller/ControllerModifyVolume" => ControllerModifyVolumeRequest, controller, controller_modify_volume;
    "/csi.v1.Node/NodeStageVolume" => NodeStageVolumeRequest, node, node_stage_volume;
    "/csi.v1.Node/NodeUnstageVolume" => NodeUnstageVolumeRequest, node, node_unstage_volume;
    "/csi.v1.Node/NodePublishVolume" => NodePublishVolumeRequest, node, node_publish_volume;
    "/csi.v1.Node/NodeUnpublishVolume" => NodeUnpublishVolumeRequest, node, node_unpublish_volume;
    "/csi.v1.Node/NodeGetVolumeStats" => NodeGetVolumeStatsRequest, node, node_get_volume_stats;
    "/csi.v1.Node/NodeExpandVolume" => NodeExpandVolumeRequest, node, node_expand_volume;
    "/csi.v1.Node/NodeGetCapabilities" => NodeGetCapabilitiesRequest, node, node_get_capabilities;
    "/csi.v1.Node/NodeGetInfo" => NodeGetInfoRequest, node, node_get_info;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_bytes_get_internal_and_change_nothing() {
    let d = Driver::start().await;
    let mut t = Table::default();
    raw_pass(&d, &mut t).await;
    t.finish();
    ok(
        d.identity().probe(ProbeRequest {}).await,
        "Probe after the malformed requests",
    );
    assert!(d.pool_images().is_empty(), "pool: {:?}", d.pool_images());
    d.finish().await;
}
