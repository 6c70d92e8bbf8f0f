//! The parsed, validated header and its rules.

use crate::class::Class;
use crate::wire::ack::{ACK_ENTRY_LEN, MAX_ACKS};
use crate::wire::auth::PacketAuth;
use crate::wire::error::WireError;
use crate::wire::failure::FAILURE_LEN;
use crate::wire::grant::GRANT_LEN;
use crate::wire::layout::{HEADER_LEN, MAGIC, PPM, VERSION, field};
use crate::wire::mac::SenderId;
use crate::wire::packet::Packet;
use crate::wire::settings::SETTINGS_LEN;
use crate::wire::types::{Collective, DType, Flags, PacketType, Phase, ReduceOp};

/// A parsed, validated header (the "representation", in smoltcp's terms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// Packet type.
    pub ty: PacketType,
    /// Flags.
    pub flags: Flags,
    /// Priority class.
    pub class: Class,
    /// Phase.
    pub phase: Phase,
    /// Element type: of DATA payloads, and of the op every op packet
    /// belongs to (version 6); [`DType::F32`] on HELLO, GRANT and GOODBYE.
    pub dtype: DType,
    /// The op's reduction (version 6); [`ReduceOp::Sum`] on HELLO, GRANT and GOODBYE.
    pub reduce: ReduceOp,
    /// The op's collective (version 6: allreduce only; version 7: all five).
    pub collective: Collective,
    /// Job id.
    pub job: u32,
    /// Sender rank.
    pub src: u32,
    /// Destination rank.
    pub dst: u32,
    /// The run the op belongs to: agreed by the job's daemons for each run
    /// of its trainers ([`crate::run`]); 0 on HELLO, GRANT and GOODBYE.
    pub run: u64,
    /// Op sequence number.
    pub op: u64,
    /// Tensor id.
    pub tensor: u32,
    /// Chunk index (DATA) or first bit of a bitmap segment (BITMAP, DONE).
    pub chunk_index: u32,
    /// Chunks in the transfer.
    pub chunk_count: u32,
    /// Non-droppable chunks in the transfer.
    pub required: u32,
    /// Loss budget, parts per million.
    pub budget_ppm: u32,
    /// Round number (PROBE/BITMAP/DONE) or heartbeat counter (HELLO).
    pub seq: u32,
    /// Payload bytes.
    pub payload_len: u16,
    /// Packet authentication mode (whether a tag follows the payload).
    pub auth: PacketAuth,
    /// The sender's session: random per endpoint incarnation (part of what
    /// its packet key is derived from).
    pub session: u64,
    /// The sender's packet number: strictly increasing per datagram within a
    /// session (the GCM nonce; see [`MacKey`](crate::wire::MacKey)).
    pub packet: u64,
    /// Flow control's credit piggybacked on every packet but HELLO and
    /// GOODBYE (version 9): the low 32 bits of the cumulative limit below
    /// which the destination may number its DATA to this sender
    /// ([`crate::flow`]); 0 carries none.
    pub credit: u32,
}

impl Header {
    /// A header with every numeric field zero, for building packets.
    pub fn new(ty: PacketType, class: Class, phase: Phase) -> Header {
        Header {
            ty,
            flags: Flags::default(),
            class,
            phase,
            dtype: DType::F32,
            reduce: ReduceOp::Sum,
            collective: Collective::Allreduce,
            job: 0,
            src: 0,
            dst: 0,
            run: 0,
            op: 0,
            tensor: 0,
            chunk_index: 0,
            chunk_count: 0,
            required: 0,
            budget_ppm: 0,
            seq: 0,
            payload_len: 0,
            auth: PacketAuth::AesGmac,
            session: 0,
            packet: 0,
            credit: 0,
        }
    }

    /// Parse and validate the header of a length-checked packet view.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Header, WireError> {
        let ty = PacketType::from_u8(p.raw_type())?;
        // Every bit of the flags byte is a flag since version 6 (bit 7 is
        // LAST): which ones a type may carry is checked in `check`.
        let flags = p.flags();
        let class = Class::new(p.raw_class()).ok_or(WireError::BadClass(p.raw_class()))?;
        let phase = Phase::from_u8(p.raw_phase())?;
        let dtype = DType::from_u8(p.raw_dtype())?;
        let collective = Collective::from_u8(p.raw_kind() >> 4)?;
        let reduce = ReduceOp::from_u8(p.raw_kind() & 0x0F)?;
        let h = Header {
            ty,
            flags,
            class,
            phase,
            dtype,
            reduce,
            collective,
            job: p.job(),
            src: p.src(),
            dst: p.dst(),
            run: p.run(),
            op: p.op(),
            tensor: p.tensor(),
            chunk_index: p.chunk_index(),
            chunk_count: p.chunk_count(),
            required: p.required(),
            budget_ppm: p.budget_ppm(),
            seq: p.seq(),
            payload_len: p.payload_len(),
            auth: p.auth(),
            session: p.session(),
            packet: p.packet(),
            credit: p.credit(),
        };
        h.check()?;
        Ok(h)
    }

    /// The op's element type and kind (versions 6, 7): a packet about no op
    /// names none; a collective that does not reduce carries sum, and its
    /// packets belong to the phases it has.
    fn check_kind(&self, phaseless: bool) -> Result<(), WireError> {
        // A packet about no op names no element type or reduction (version
        // 6), nor does an ACK, about several (version 10).
        let opless = phaseless || self.ty == PacketType::Ack;
        if opless && self.dtype != DType::F32 {
            return Err(WireError::BadField("dtype"));
        }
        if opless && (self.reduce != ReduceOp::Sum || self.collective != Collective::Allreduce) {
            return Err(WireError::BadField("kind"));
        }
        // Version 7: a collective that does not reduce carries sum, and its
        // packets belong to the phases it has.
        if !phaseless && !self.collective.reduces() && self.reduce != ReduceOp::Sum {
            return Err(WireError::BadField("kind"));
        }
        let has_phase = match self.phase {
            Phase::Scatter => self.collective.scatters(),
            Phase::Gather => self.collective.gathers(),
            Phase::None => true,
        };
        if !phaseless && !has_phase {
            return Err(WireError::BadPhase(self.phase as u8));
        }
        Ok(())
    }

    /// Semantic checks shared by [`Header::parse`] and [`Header::emit`].
    pub fn check(&self) -> Result<(), WireError> {
        let allowed_flags = match self.ty {
            PacketType::Data => Flags::REPAIR.0 | Flags::REQUIRED.0 | Flags::BACKLOG.0 | Flags::LAST.0,
            PacketType::Bitmap => Flags::COMPLETE.0,
            PacketType::Done => Flags::MASK_EMPTY.0 | Flags::FAILED.0,
            PacketType::Grant => Flags::REQUEST.0,
            PacketType::Probe | PacketType::Hello | PacketType::Goodbye | PacketType::Ack => 0,
        };
        if self.flags.0 & !allowed_flags != 0 {
            return Err(WireError::BadFlags(self.flags.0));
        }
        let phaseless = self.ty.is_phaseless();
        if phaseless && self.run != 0 {
            return Err(WireError::BadField("run"));
        }
        self.check_kind(phaseless)?;
        match (phaseless, self.phase) {
            (true, Phase::None) => {}
            (true, p) | (_, p @ Phase::None) => {
                return Err(WireError::BadPhase(p as u8));
            }
            _ => {}
        }
        if self.ty.is_control() && self.class != Class::CONTROL {
            return Err(WireError::BadClass(self.class.get()));
        }
        if self.ty == PacketType::Data && self.class == Class::CONTROL {
            return Err(WireError::BadClass(self.class.get()));
        }
        if matches!(self.ty, PacketType::Hello | PacketType::Goodbye) && self.credit != 0 {
            return Err(WireError::BadField("credit"));
        }
        if self.src == self.dst {
            return Err(WireError::BadField("dst"));
        }
        if self.budget_ppm > PPM {
            return Err(WireError::BadField("budget_ppm"));
        }
        if !phaseless {
            if self.chunk_count == 0 {
                return Err(WireError::BadField("chunk_count"));
            }
            if self.required > self.chunk_count {
                return Err(WireError::BadField("required"));
            }
        }
        let len = usize::from(self.payload_len);
        match self.ty {
            PacketType::Data => {
                if self.chunk_index >= self.chunk_count {
                    return Err(WireError::BadField("chunk_index"));
                }
                if len == 0 || len % self.dtype.size() != 0 {
                    return Err(WireError::BadField("payload_len"));
                }
            }
            PacketType::Done if self.flags.contains(Flags::FAILED) => {
                // A failing DONE (version 5): its reason, and no segment.
                if self.flags.contains(Flags::MASK_EMPTY) {
                    return Err(WireError::BadFlags(self.flags.0));
                }
                if len != FAILURE_LEN {
                    return Err(WireError::BadField("payload_len"));
                }
                if self.chunk_index != 0 {
                    return Err(WireError::BadField("chunk_index"));
                }
            }
            PacketType::Bitmap | PacketType::Done => {
                let no_payload =
                    self.flags.contains(Flags::COMPLETE) || self.flags.contains(Flags::MASK_EMPTY);
                if no_payload != (len == 0) {
                    return Err(WireError::BadField("payload_len"));
                }
                if self.chunk_index % 8 != 0 || (len > 0 && self.chunk_index >= self.chunk_count) {
                    return Err(WireError::BadField("chunk_index"));
                }
                // The segment ends at the byte holding bit `chunk_count - 1`
                // (chunk_index < chunk_count here whenever len > 0).
                if len > 0 && len > (self.chunk_count - self.chunk_index).div_ceil(8) as usize {
                    return Err(WireError::BadField("payload_len"));
                }
            }
            PacketType::Probe => {
                if len != GRANT_LEN {
                    return Err(WireError::BadField("payload_len"));
                }
                if self.chunk_index >= self.chunk_count {
                    return Err(WireError::BadField("chunk_index"));
                }
            }
            PacketType::Hello => {
                if len != SETTINGS_LEN {
                    return Err(WireError::BadField("payload_len"));
                }
            }
            PacketType::Grant => {
                if len != GRANT_LEN {
                    return Err(WireError::BadField("payload_len"));
                }
            }
            PacketType::Goodbye => {
                if len != 0 {
                    return Err(WireError::BadField("payload_len"));
                }
            }
            PacketType::Ack => {
                // About several ops of one run, each an all-gather transfer:
                // no op of its own, entries counted in `chunk_count`.
                if self.phase != Phase::Gather {
                    return Err(WireError::BadPhase(self.phase as u8));
                }
                if self.op != 0 || self.tensor != 0 {
                    return Err(WireError::BadField("op"));
                }
                if self.chunk_count as usize > MAX_ACKS {
                    return Err(WireError::BadField("chunk_count"));
                }
                if self.chunk_index != 0 || self.required != 0 || self.budget_ppm != 0 || self.seq != 0 {
                    return Err(WireError::BadField("chunk_index"));
                }
                if len != self.chunk_count as usize * ACK_ENTRY_LEN {
                    return Err(WireError::BadField("payload_len"));
                }
            }
        }
        Ok(())
    }

    /// The sender this header names: whose packet key tags the datagram.
    pub fn sender(&self) -> SenderId {
        SenderId { job: self.job, rank: self.src, session: self.session }
    }

    /// Total datagram length for this header.
    pub fn packet_len(&self) -> usize {
        HEADER_LEN + usize::from(self.payload_len) + self.auth.tag_len()
    }

    /// Write the header into the first [`HEADER_LEN`] bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        self.check()?;
        if buf.len() < HEADER_LEN {
            return Err(WireError::BufferTooSmall { need: HEADER_LEN, have: buf.len() });
        }
        buf[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
        buf[field::VERSION] = VERSION;
        buf[field::TYPE] = self.ty as u8;
        buf[field::FLAGS] = self.flags.0;
        buf[field::CLASS] = self.class.get();
        buf[field::PHASE] = self.phase as u8;
        buf[field::DTYPE] = self.dtype as u8;
        buf[field::JOB].copy_from_slice(&self.job.to_be_bytes());
        buf[field::SRC].copy_from_slice(&self.src.to_be_bytes());
        buf[field::DST].copy_from_slice(&self.dst.to_be_bytes());
        buf[field::RUN].copy_from_slice(&self.run.to_be_bytes());
        buf[field::OP].copy_from_slice(&self.op.to_be_bytes());
        buf[field::TENSOR].copy_from_slice(&self.tensor.to_be_bytes());
        buf[field::CHUNK_INDEX].copy_from_slice(&self.chunk_index.to_be_bytes());
        buf[field::CHUNK_COUNT].copy_from_slice(&self.chunk_count.to_be_bytes());
        buf[field::REQUIRED].copy_from_slice(&self.required.to_be_bytes());
        buf[field::BUDGET].copy_from_slice(&self.budget_ppm.to_be_bytes());
        buf[field::SEQ].copy_from_slice(&self.seq.to_be_bytes());
        buf[field::PAYLOAD_LEN].copy_from_slice(&self.payload_len.to_be_bytes());
        buf[field::AUTH] = self.auth as u8;
        buf[field::KIND] = (self.collective as u8) << 4 | self.reduce as u8;
        buf[field::SESSION].copy_from_slice(&self.session.to_be_bytes());
        buf[field::PACKET].copy_from_slice(&self.packet.to_be_bytes());
        buf[field::CREDIT].copy_from_slice(&self.credit.to_be_bytes());
        Ok(())
    }
}
